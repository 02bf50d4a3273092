"""hfl: communication-efficient hierarchical federated learning across datacenters, in JAX."""
