"""kubelet stand-ins speaking the real gRPC protocols over unix sockets: :mod:`.deviceplugin` (kubelet's
device manager: ``Registration``, ListAndWatch, Allocate) and :mod:`.dra` (the plugin watcher's
``pluginregistration`` and DRA NodePrepare/Unprepare), on what :mod:`.common` says once for both."""
