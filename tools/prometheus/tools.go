//go:build tools

// Package tools pins Prometheus's promtool, which tests the stack's alerting rules (promtool test rules)
// and checks them (promtool check rules); see tools/build.sh.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
