"""What the target cluster already holds that the stack would collide with, found before anything changes.

``pulumi preview`` (and the preview half of ``pulumi up``) runs the program against a live cluster, but
the Kubernetes provider forces its server-side dry-runs for objects new to the stack, so an object another
stack or another installer owns shows no conflict until ``up`` applies it halfway. The program calls
:func:`nvidia_gpu.preflight.check.run` first: it reads the cluster (read and dry-run only) and refuses
the run with one line per collision, or warns where the two installations can live side by side.

The one write: :mod:`nvidia_gpu.preflight.nodetemplate`, at ``up`` only, releases other managers' claims
on the Deckhouse NodeGroups' node template containers, without which ``destroy`` cannot withdraw the
stack's labels.
"""
