//go:build tools

// Package tools pins the etcd server the cluster tests build (see tools/build.sh).
package tools

import _ "go.etcd.io/etcd/server/v3"
