//! Real network namespaces, bridges and subnets unique to each test.
