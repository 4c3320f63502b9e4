// Command cdi-inject applies CDI devices to an OCI runtime spec the way containerd and CRI-O do: it loads the
// spec directories with the CNCF container-device-interface library (the same code, the same strict
// parsing and version checks) and injects the named devices into config.json.
//
//	cdi-inject -spec-dirs /etc/cdi,/var/run/cdi -config bundle/config.json vendor/class=name ...
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	dirs := flag.String("spec-dirs", "/etc/cdi,/var/run/cdi", "comma-separated CDI spec directories")
	config := flag.String("config", "config.json", "OCI runtime spec to edit in place")
	list := flag.Bool("list", false, "print the devices the directories define and exit")
	flag.Parse()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(strings.Split(*dirs, ",")...), cdi.WithAutoRefresh(false))
	if err != nil {
		fail("cache: %v", err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		for path, list := range errs {
			for _, e := range list {
				fmt.Fprintf(os.Stderr, "spec error: %s: %v\n", path, e)
			}
		}
		os.Exit(2)
	}
	if *list {
		for _, d := range cache.ListDevices() {
			fmt.Println(d)
		}
		return
	}
	data, err := os.ReadFile(*config)
	if err != nil {
		fail("%v", err)
	}
	var spec oci.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		fail("%s: %v", *config, err)
	}
	unresolved, err := cache.InjectDevices(&spec, flag.Args()...)
	if err != nil {
		fail("inject %v (unresolved %v): %v", flag.Args(), unresolved, err)
	}
	out, err := json.MarshalIndent(&spec, "", "  ")
	if err != nil {
		fail("%v", err)
	}
	if err := os.WriteFile(*config, out, 0o644); err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "cdi-inject: "+format+"\n", args...)
	os.Exit(1)
}
