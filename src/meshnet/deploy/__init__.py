"""Running meshnet on machines: how each component is launched (``launch``: its argv from its typed
config, the ready line it prints), `meshnet up` (one machine, every component), the launch specs
of a local expert group, and the multi-host lab in network namespaces."""
