//go:build tools

// Package tools pins Pulumi YAML's language host, which runs the YAML programs that use this
// repository's component package (tests/cluster/test_component_package.py).
package tools

import _ "github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml"
