//go:build tools

// Package tools pins the kwok controller the cluster tests build (see tools/build.sh).
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
