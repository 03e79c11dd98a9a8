// Package deploy holds what runs Airlock on a platform rather than on
// hosts: the Helm chart in helm/airlock. Its tests render the chart with
// Helm's own library, decode every object strictly into its Kubernetes API
// type and check the properties the chart promises. Nothing imports it.
package deploy
