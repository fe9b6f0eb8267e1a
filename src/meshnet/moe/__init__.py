"""Expert parallelism for MoE models, as one vertical feature: which node owns which experts, the
engine hook that computes only local experts, the row exchange between nodes, the expert node
server, the group front a swarm routes to, and its certification."""
