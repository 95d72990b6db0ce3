// Command k8s is a multi-call binary holding kube-apiserver, kube-controller-manager,
// kube-scheduler and kubectl at one pinned Kubernetes version.
//
// It dispatches on the name it was started under (a symlink such as bin/kube-apiserver)
// or, failing that, on its first argument, and builds only the command it runs so that
// process-wide registrations (signal handlers, component globals) happen once.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	_ "time/tzdata" // CronJob time zones, as upstream's apiserver and controller-manager

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var components = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

func main() {
	name := filepath.Base(os.Args[0])
	if !known(name) && len(os.Args) > 1 && known(os.Args[1]) {
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	switch name {
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(kcm.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubectl":
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err) // prints the error as kubectl does and exits non-zero
		}
	default:
		fmt.Fprintf(os.Stderr, "usage: k8s {%s} [flags]\n", joined())
		os.Exit(2)
	}
}

func known(name string) bool {
	for _, c := range components {
		if c == name {
			return true
		}
	}
	return false
}

func joined() string {
	out := ""
	for i, c := range components {
		if i > 0 {
			out += "|"
		}
		out += c
	}
	return out
}
