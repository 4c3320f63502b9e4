// What `pulumi policy publish` uploads from a policy pack directory, by the CLI's own code: the same
// archive.TGZ call (prefix "package", default excludes, every .gitignore from the directory up to /) at
// the version tools/pulumi pins. tools/policypack.py builds it with tools/pulumi's go.mod and go.sum
// (`tools/policypack.py uploads DIR`) and prints one line per file: its name in the tarball and its size.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/pulumi/pulumi/sdk/v3/go/common/util/archive"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: policy-archive DIR")
		os.Exit(2)
	}
	// The CLI archives its working directory, an absolute path: relative ones match .gitignore files differently.
	dir, err := filepath.Abs(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	data, err := archive.TGZ(dir, "package", true)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gz, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%s\t%d\n", h.Name, h.Size)
	}
}
