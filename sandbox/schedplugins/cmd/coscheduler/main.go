// Command coscheduler is kubernetes-sigs/scheduler-plugins' scheduler at the pinned release with one out-of-tree
// plugin registered: Coscheduling (PodGroup gangs through Permit). It is the upstream cmd/scheduler main with the
// other plugins left out (fewer packages to compile); kube-scheduler's own command, flags and config are unchanged.
// bench/gangs runs it as the reference beside crane-scheduler.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // rest client metric registration
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric registration
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme" // CoschedulingArgs in the scheduler's config
	"sigs.k8s.io/scheduler-plugins/pkg/coscheduling"
)

func main() {
	command := app.NewSchedulerCommand(app.WithPlugin(coscheduling.Name, coscheduling.New))
	code := cli.Run(command)
	os.Exit(code)
}
