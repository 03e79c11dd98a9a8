package runspec

import "strings"

// CredentialEnvPrefix, then a brokered credential's name (CredentialEnv),
// is the variable that holds the credential's placeholder in a job.
const CredentialEnvPrefix = "AIRLOCK_CREDENTIAL_"

// CredentialEnv is the variable holding brokered credential name's
// placeholder: CredentialEnvPrefix and the name upper-cased, every byte
// but A-Z and 0-9 made '_'. Two names a job may hold together must not
// have the same.
func CredentialEnv(name string) string {
	b := []byte(strings.ToUpper(name))
	for i, c := range b {
		if !('A' <= c && c <= 'Z') && !('0' <= c && c <= '9') {
			b[i] = '_'
		}
	}
	return CredentialEnvPrefix + string(b)
}
