//go:build tools

// Package tools pins the Pulumi CLI the stack tests run (see tools/build.sh).
package tools

import _ "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"
