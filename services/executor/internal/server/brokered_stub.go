//go:build !brokered

package server

import (
	"github.com/airlockhq/airlock/services/executor/internal/authorityclient"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
)

// credentialLeaser is none until the authority client can lease brokered
// credentials (brokered.go; this file goes at merge): the run manager
// refuses every grant that names one.
func credentialLeaser(*authorityclient.Client) runs.CredentialLeaser { return nil }
