package config

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/config/configtest"
)

// --check-config on real files: a good config passes, creating and
// binding nothing; each bad one fails naming its field.
func TestCheck(t *testing.T) {
	f := configtest.New(t, "publisher")
	good := f.Common() + "authority: {address: 127.0.0.1:7401, grant_public_key: grant.key.pub}\n"
	cases := append([]configtest.Case{
		{Name: "good", Body: good, Summary: "listen " + f.Listen + ", trust domain airlock.test, data dir " + f.Dir + "/data/publisher, authority 127.0.0.1:7401, store sqlite; data_dir " + f.Dir + "/data/publisher will be created"},
		{Name: "grant public key not PEM", Body: strings.Replace(good, "grant.key.pub", "not-pem.crt", 1), Field: "authority.grant_public_key"},
		{Name: "decode depth out of range", Body: good + "scan: {decode_depth: 99}\n", Field: "scan.decode_depth"},
	}, append(f.GoodCommon(good), f.BadCommon(good)...)...)
	f.Run(t, Check, cases)
}
