//go:build tools

// Package tools pins actionlint, the linter tests/repo/test_workflows.py runs over .github/workflows.
package tools

import _ "github.com/rhysd/actionlint/cmd/actionlint"
