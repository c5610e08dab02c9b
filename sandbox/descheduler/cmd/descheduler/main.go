// Command descheduler runs kubernetes-sigs/descheduler's own command (its app package) at the pinned release: the
// comparison backend of bench/rebalance (LowNodeUtilization with Prometheus metrics). One addition: the descheduler's
// Prometheus client loads a pod's service-account CA from a fixed path (client.K8sPodCAFilePath), which does not
// exist when it runs as a process outside a pod; DESCHEDULER_POD_CA_FILE points it at the sandbox's CA.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"sigs.k8s.io/descheduler/cmd/descheduler/app"
	"sigs.k8s.io/descheduler/pkg/descheduler/client"
)

func main() {
	if path := os.Getenv("DESCHEDULER_POD_CA_FILE"); path != "" {
		client.K8sPodCAFilePath = path
	}
	out := os.Stdout
	cmd := app.NewDeschedulerCommand(out)
	cmd.AddCommand(app.NewVersionCommand())

	code := cli.Run(cmd)
	os.Exit(code)
}
