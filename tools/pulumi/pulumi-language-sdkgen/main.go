// Command pulumi-language-sdkgen is the SDK generation of Pulumi's Node.js and Go language hosts, which
// tools/build.sh builds twice beside the pinned CLI: as pulumi-language-nodejs (-X main.language=nodejs)
// and as pulumi-language-go (-X main.language=go). Pulumi's own hosts are modules of their own
// (github.com/pulumi/pulumi/sdk/nodejs/cmd/pulumi-language-nodejs/v3, .../sdk/go/pulumi-language-go/v3) that
// the module proxy refuses, and `pulumi package gen-sdk` asks the language's host to generate the SDK
// (GeneratePackage). The generators themselves are the CLI's packages, at the pinned pkg/v3:
// codegen/nodejs and codegen/go, called as Pulumi's hosts call them.
//
// Only SDK generation is implemented: running a program (`runtime: nodejs` or `go`), installing its
// dependencies and linking an SDK into a project get Unimplemented. The component package's tests run their
// TypeScript and Go programs through the Automation API instead (tests/cluster/test_component_sdks.py).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	gogen "github.com/pulumi/pulumi/pkg/v3/codegen/go"
	nodejsgen "github.com/pulumi/pulumi/pkg/v3/codegen/nodejs"
	"github.com/pulumi/pulumi/pkg/v3/codegen/schema"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource/plugin"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/logging"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// language is set by tools/build.sh: nodejs or go.
var language = ""

// version is set by tools/build.sh to the pinned pkg/v3 version whose generators this host runs.
var version = "0.0.0"

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer
}

func (h *host) Handshake(ctx context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *host) GetPluginInfo(ctx context.Context, _ *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version}, nil
}

// GeneratePackage binds the schema the CLI sends (its references resolved through the CLI's loader) and
// writes the language's SDK into the request's directory.
func (h *host) GeneratePackage(ctx context.Context, req *pulumirpc.GeneratePackageRequest,
) (*pulumirpc.GeneratePackageResponse, error) {
	loader, err := schema.NewLoaderClient(req.GetLoaderTarget())
	if err != nil {
		return nil, err
	}
	defer loader.Close()

	var spec schema.PackageSpec
	if err := json.Unmarshal([]byte(req.GetSchema()), &spec); err != nil {
		return nil, fmt.Errorf("reading the schema: %w", err)
	}
	pkg, diags, err := schema.BindSpec(spec, loader, schema.ValidationOptions{AllowDanglingReferences: true})
	if err != nil {
		return nil, err
	}
	resp := &pulumirpc.GeneratePackageResponse{Diagnostics: plugin.HclDiagnosticsToRPCDiagnostics(diags)}
	if diags.HasErrors() {
		return resp, nil
	}

	var files map[string][]byte
	switch language {
	case "nodejs":
		files, err = nodejsgen.GeneratePackage("pulumi-language-nodejs", pkg, req.GetExtraFiles(),
			req.GetLocalDependencies(), req.GetLocal(), loader)
	case "go":
		files, err = gogen.GeneratePackage("pulumi-language-go", pkg, req.GetLocalDependencies())
	default:
		err = fmt.Errorf("built for no language (%q): tools/build.sh sets main.language", language)
	}
	if err != nil {
		return nil, err
	}
	for name, data := range files {
		path := filepath.Join(req.GetDirectory(), name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, data, 0o644); err != nil { //nolint:gosec // generated sources, world-readable
			return nil, err
		}
	}
	return resp, nil
}

func main() {
	// The engine passes --tracing (not used here) and, when asked to, --logtostderr and -v, which the
	// logging package registers; a plugin's runtime options arrive as flags too (none is used here).
	flag.String("tracing", "", "Zipkin-compatible tracing endpoint (ignored)")
	flag.String("root", "", "the plugin's root directory (ignored)")
	flag.Parse()
	logging.InitLogging(false, 0, false)

	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, &host{})
			return nil
		},
		Options: rpcutil.OpenTracingServerInterceptorOptions(nil),
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "fatal: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fmt.Fprintf(os.Stderr, "fatal: %v\n", err)
		os.Exit(1)
	}
}
