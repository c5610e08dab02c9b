// Command kube-controller-manager is the upstream controller manager, unchanged, built at the pinned release:
// the sandbox needs its Deployment, ReplicaSet, StatefulSet, Job, DaemonSet, garbage-collector, namespace,
// service-account and node-lifecycle controllers so ordinary workloads reach the scheduler.
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
