// Command pulumi-language-python is the Python language host that tools/build.sh builds beside the
// pinned Pulumi CLI. Pulumi's own host is a module of its own
// (github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3) that the module proxy refuses,
// so this is a small host written for the stack tests. It implements what `pulumi preview`, `up`
// and `destroy` ask of a language host, with Pulumi's own parts where they exist:
//
//   - the Python environment is the one Pulumi's python/toolchain package (in the pinned sdk/v3)
//     picks from the project's runtime options: `virtualenv` (relative to the project root, or
//     absolute) and `toolchain` (pip, poetry, uv), else the `python` on PATH;
//   - the program runs under pulumi-language-python-exec, the driver script that ships in sdk/v3
//     (tools/build.sh copies it beside this binary), with the arguments and the PULUMI_CONFIG /
//     PULUMI_CONFIG_SECRET_KEYS environment that the script reads;
//   - the plugins a program needs are the pulumi-plugin.json files of the packages installed in
//     that environment, as Pulumi's host reports them, so the engine loads them before the run
//     (from PATH: the provider plugin sits in the same bin directory).
//
// Plugins written in Python (policy packs) run the same way, with their output streamed back.
//
// Dependency installation creates a missing virtual environment from requirements.txt and keeps an
// existing one (`pulumi install`, `pulumi package add` of a Python component package).
//
// Not implemented (the engine gets Unimplemented): `pulumi new` prompts and templates, program
// generation, packing SDKs, debugging, and the type checker option.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/blang/semver"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/logging"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"github.com/pulumi/pulumi/sdk/v3/python/toolchain"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// version is set by tools/build.sh to the pinned sdk/v3 version whose exec script this host runs.
var version = "dev"

// bailExitCode is what pulumi-language-python-exec exits with after it has shown the user an
// error message itself: the engine should stop without adding its own.
const bailExitCode = 32

// pluginsScript prints, as JSON, the pulumi-plugin.json of every installed distribution that has
// one and declares a resource plugin (what Pulumi's host reports as the program's packages).
const pluginsScript = `
import json, importlib.metadata as md
out = []
for d in md.distributions():
    for f in d.files or ():
        if f.name == "pulumi-plugin.json":
            try:
                p = json.loads(f.read_text())
            except Exception:
                continue
            if p.get("resource") and p.get("name"):
                out.append(p)
print(json.dumps(out))
`

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer
	execScript string
	// defaults are the runtime options the engine passes as flags when it starts this host for a
	// plugin (a component provider's PulumiPlugin.yaml: -virtualenv, -toolchain), used where the
	// request's own options do not set them.
	defaults map[string]any

	mu     sync.Mutex
	engine string
}

func (h *host) Handshake(ctx context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.engine = req.GetEngineAddress()
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *host) GetPluginInfo(ctx context.Context, _ *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version}, nil
}

// resolve returns the Python toolchain that the project's (or plugin's) runtime options select.
func (h *host) resolve(info *pulumirpc.ProgramInfo) (toolchain.Toolchain, error) {
	opts := toolchain.PythonOptions{Root: info.GetRootDirectory(), ProgramDir: info.GetProgramDirectory()}
	m := map[string]any{}
	for k, v := range h.defaults {
		m[k] = v
	}
	if s := info.GetOptions(); s != nil {
		for k, v := range s.AsMap() {
			m[k] = v
		}
	}
	if v, ok := m["virtualenv"].(string); ok {
		opts.Virtualenv = v
	}
	switch tc, _ := m["toolchain"].(string); tc {
	case "", "auto":
		opts.Toolchain = toolchain.Auto
	case "pip":
		opts.Toolchain = toolchain.Pip
	case "poetry":
		opts.Toolchain = toolchain.Poetry
	case "uv":
		opts.Toolchain = toolchain.Uv
	default:
		return nil, fmt.Errorf("unsupported python toolchain %q (pip, poetry or uv)", tc)
	}
	return toolchain.ResolveToolchain(opts)
}

func (h *host) GetRequiredPackages(ctx context.Context, req *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	tc, err := h.resolve(req.GetInfo())
	if err != nil {
		return nil, err
	}
	cmd, err := tc.Command(ctx, "-c", pluginsScript)
	if err != nil {
		return nil, err
	}
	cmd.Dir = req.GetInfo().GetProgramDirectory()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing the pulumi plugins of installed python packages: %w: %s", err, stderr.String())
	}
	var plugins []struct {
		Name    string `json:"name"`
		Version string `json:"version"`
		Server  string `json:"server"`
	}
	if err := json.Unmarshal(out, &plugins); err != nil {
		return nil, fmt.Errorf("reading the pulumi plugins of installed python packages: %w", err)
	}
	resp := &pulumirpc.GetRequiredPackagesResponse{}
	for _, p := range plugins {
		v := strings.TrimPrefix(p.Version, "v")
		if _, err := semver.ParseTolerant(v); err != nil {
			logging.V(5).Infof("skipping plugin %s with version %q: %v", p.Name, p.Version, err)
			continue
		}
		resp.Packages = append(resp.Packages, &pulumirpc.PackageDependency{
			Kind: "resource", Name: p.Name, Version: v, Server: p.Server,
		})
	}
	return resp, nil
}

func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	info := req.GetInfo()
	tc, err := h.resolve(info)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	engine := h.engine
	h.mu.Unlock()
	if engine == "" {
		engine = flag.Arg(0)
	}
	program := info.GetEntryPoint()
	if program == "" {
		program = "."
	}
	if !filepath.IsAbs(program) {
		program = filepath.Join(info.GetProgramDirectory(), program)
	}
	args := []string{"-u", h.execScript,
		"--monitor", req.GetMonitorAddress(),
		"--engine", engine,
		"--project", req.GetProject(),
		"--stack", req.GetStack(),
		"--pwd", req.GetPwd(),
		"--root_directory", info.GetRootDirectory(),
		"--parallel", strconv.Itoa(int(req.GetParallel())),
	}
	if req.GetDryRun() {
		args = append(args, "--dry_run", "true")
	}
	if org := req.GetOrganization(); org != "" {
		args = append(args, "--organization", org)
	}
	args = append(args, program)
	args = append(args, req.GetArgs()...)

	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return nil, err
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cfg := req.GetConfig()
	if cfg == nil {
		cfg = map[string]string{} // the exec script wants an object, even an empty one
	}
	config, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	secretKeys := req.GetConfigSecretKeys()
	if secretKeys == nil {
		secretKeys = []string{}
	}
	secrets, err := json.Marshal(secretKeys)
	if err != nil {
		return nil, err
	}
	cmd.Env = append(cmd.Env, "PULUMI_CONFIG="+string(config), "PULUMI_CONFIG_SECRET_KEYS="+string(secrets))
	cmd.Dir = req.GetPwd()
	// The engine shows what the host prints as the program's output.
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			if exit.ExitCode() == bailExitCode {
				return &pulumirpc.RunResponse{Bail: true}, nil
			}
			return &pulumirpc.RunResponse{
				Error: fmt.Sprintf("Program exited with non-zero exit code: %d", exit.ExitCode()),
			}, nil
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("running the python program: %v", err)}, nil
	}
	return &pulumirpc.RunResponse{}, nil
}

// RunPlugin runs a plugin written in Python, such as a policy pack (pulumi_policy.PolicyPack, which
// prints the port it serves on), and streams its output back to the engine.
func (h *host) RunPlugin(req *pulumirpc.RunPluginRequest, server pulumirpc.LanguageRuntime_RunPluginServer) error {
	info := req.GetInfo()
	tc, err := h.resolve(info)
	if err != nil {
		return err
	}
	program := info.GetEntryPoint()
	if program == "" {
		program = "."
	}
	if !filepath.IsAbs(program) {
		program = filepath.Join(info.GetProgramDirectory(), program)
	}
	cmd, err := tc.Command(server.Context(), append([]string{"-u", program}, req.GetArgs()...)...)
	if err != nil {
		return err
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, req.GetEnv()...)
	cmd.Dir = req.GetPwd()
	var mu sync.Mutex
	send := func(r *pulumirpc.RunPluginResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return server.Send(r)
	}
	cmd.Stdout = writerFunc(func(b []byte) error {
		return send(&pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Stdout{Stdout: b}})
	})
	cmd.Stderr = writerFunc(func(b []byte) error {
		return send(&pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Stderr{Stderr: b}})
	})
	code := 0
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			return fmt.Errorf("running the python plugin: %w", err)
		}
		code = exit.ExitCode()
	}
	return send(&pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Exitcode{Exitcode: int32(code)}})
}

// InstallDependencies makes the program's (or plugin's) virtual environment exist, as `pulumi install`
// and `pulumi package add` ask before they run a source plugin: an existing environment is checked
// and kept (nothing is downloaded), a missing one is created from requirements.txt by Pulumi's own
// toolchain code.
func (h *host) InstallDependencies(req *pulumirpc.InstallDependenciesRequest,
	server pulumirpc.LanguageRuntime_InstallDependenciesServer,
) error {
	info := req.GetInfo()
	if info == nil {
		info = &pulumirpc.ProgramInfo{RootDirectory: req.GetDirectory(), ProgramDirectory: req.GetDirectory()}
	}
	tc, err := h.resolve(info)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	stream := func(stderr bool) writerFunc {
		return func(b []byte) error {
			mu.Lock()
			defer mu.Unlock()
			if stderr {
				return server.Send(&pulumirpc.InstallDependenciesResponse{Stderr: b})
			}
			return server.Send(&pulumirpc.InstallDependenciesResponse{Stdout: b})
		}
	}
	dir := info.GetProgramDirectory()
	if err := tc.EnsureVenv(server.Context(), dir, false, true, stream(false), stream(true)); err != nil {
		return err
	}
	return tc.ValidateVenv(server.Context())
}

// writerFunc is an io.Writer that hands each write (a copy) to a function.
type writerFunc func([]byte) error

func (f writerFunc) Write(b []byte) (int, error) {
	if err := f(append([]byte(nil), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// GetRequiredPlugins is the older form of GetRequiredPackages, for engines that still ask it.
func (h *host) GetRequiredPlugins(ctx context.Context, req *pulumirpc.GetRequiredPluginsRequest,
) (*pulumirpc.GetRequiredPluginsResponse, error) {
	pkgs, err := h.GetRequiredPackages(ctx, &pulumirpc.GetRequiredPackagesRequest{Info: req.GetInfo()})
	if err != nil {
		return nil, err
	}
	resp := &pulumirpc.GetRequiredPluginsResponse{}
	for _, p := range pkgs.GetPackages() {
		resp.Plugins = append(resp.Plugins, &pulumirpc.PluginDependency{
			Kind: p.GetKind(), Name: p.GetName(), Version: p.GetVersion(), Server: p.GetServer(),
		})
	}
	return resp, nil
}

// GetProgramDependencies lists the environment's packages, for `pulumi about`.
func (h *host) GetProgramDependencies(ctx context.Context, req *pulumirpc.GetProgramDependenciesRequest,
) (*pulumirpc.GetProgramDependenciesResponse, error) {
	tc, err := h.resolve(req.GetInfo())
	if err != nil {
		return nil, err
	}
	deps, err := tc.ListPackages(ctx, req.GetTransitiveDependencies())
	if err != nil {
		return nil, err
	}
	resp := &pulumirpc.GetProgramDependenciesResponse{}
	for _, d := range deps {
		resp.Dependencies = append(resp.Dependencies, &pulumirpc.DependencyInfo{Name: d.Name, Version: d.Version})
	}
	return resp, nil
}

func main() {
	// The engine passes --tracing (not used here) and, when asked to, --logtostderr and -v, which the
	// logging package registers.
	flag.String("tracing", "", "Zipkin-compatible tracing endpoint (ignored)")
	// A plugin's runtime options (PulumiPlugin.yaml) arrive as flags, as Pulumi's own host takes them.
	virtualenv := flag.String("virtualenv", "", "the virtual environment to run in (plugins)")
	tc := flag.String("toolchain", "", "pip, poetry or uv (plugins)")
	flag.String("typechecker", "", "not supported here (ignored)")
	flag.String("root", "", "the plugin's root directory (ignored: the request names it)")
	flag.Parse()
	logging.InitLogging(false, 0, false)

	self, err := os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "fatal: locating pulumi-language-python: %v\n", err)
		os.Exit(1)
	}
	execScript := filepath.Join(filepath.Dir(self), "pulumi-language-python-exec")
	if _, err := os.Stat(execScript); err != nil {
		fmt.Fprintf(os.Stderr, "fatal: %v (tools/build.sh puts it beside this binary)\n", err)
		os.Exit(1)
	}

	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Init: func(srv *grpc.Server) error {
			defaults := map[string]any{}
			if *virtualenv != "" {
				defaults["virtualenv"] = *virtualenv
			}
			if *tc != "" {
				defaults["toolchain"] = *tc
			}
			pulumirpc.RegisterLanguageRuntimeServer(srv, &host{execScript: execScript, defaults: defaults})
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
