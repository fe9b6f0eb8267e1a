"""Running meshnet on machines: `meshnet up` (one machine, every component), the multi-host lab in
network namespaces, and the launch specs both use."""
