"""Entry point the Pulumi engine runs for the component package (``PulumiPlugin.yaml``): serve, never return."""

from nvidia_gpu.package import serve

if __name__ == "__main__":
    serve()
