package cli

import (
	"crypto/x509"
	"os"

	"github.com/airlockhq/airlock/pkg/pki"
)

func readCert(path string) (*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return pki.ParseCertificatePEM(data)
}
