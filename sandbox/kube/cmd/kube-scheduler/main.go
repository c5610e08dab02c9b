// Command kube-scheduler is the upstream scheduler, unchanged, built at the pinned release (for comparisons).
package main

import (
	"crane.local/kubebin/internal/component"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	component.Main(app.NewSchedulerCommand())
}
