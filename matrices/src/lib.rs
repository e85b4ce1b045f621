//! relattn-matrices: parameter axes as TOML tiers, expansion into cases, exclusions, ids, shards.
#![forbid(unsafe_code)]
