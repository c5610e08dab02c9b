// Package component is the main of every upstream Kubernetes component built here, unchanged: the JSON log
// format and the client-go and version metrics registered as in kubernetes/cmd/<component>, then the
// component's cobra command run the way component-base runs it.
package component

import (
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
)

// Main runs cmd and exits with its status.
func Main(cmd *cobra.Command) {
	os.Exit(cli.Run(cmd))
}
