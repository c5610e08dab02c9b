// Command kube-controller-manager is the upstream controller manager, unchanged, built at the pinned release:
// the sandbox needs its Deployment, ReplicaSet, StatefulSet, Job, DaemonSet, garbage-collector, namespace,
// service-account and node-lifecycle controllers so ordinary workloads reach the scheduler.
package main

import (
	_ "time/tzdata"

	"crane.local/kubebin/internal/component"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	component.Main(app.NewControllerManagerCommand())
}
