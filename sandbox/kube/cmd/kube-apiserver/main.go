// Command kube-apiserver is the upstream API server, unchanged, built at the pinned release.
package main

import (
	_ "time/tzdata"

	"crane.local/kubebin/internal/component"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	component.Main(app.NewAPIServerCommand())
}
