#!/usr/bin/env python3
"""Check that two reports of the same matrix have the same status and bit-identical GPU outputs
(the `out_hash` column) for every trial, e.g. a one-GPU run against a `--devices all` run.

usage: ci/same-outputs.py REPORT_ARCH_DIR_A REPORT_ARCH_DIR_B
exit 0 when identical, 1 otherwise.
"""
import csv
import sys


def rows(d):
    with open(f"{d}/results.csv", newline="") as f:
        return {r["trial"]: r for r in csv.DictReader(f)}


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    a, b = rows(sys.argv[1]), rows(sys.argv[2])
    common = sorted(set(a) & set(b))
    status_diff = [t for t in common if a[t]["status"] != b[t]["status"]]
    hash_diff = [t for t in common if a[t].get("out_hash", "") != b[t].get("out_hash", "")]
    hashed = sum(1 for t in common if a[t].get("out_hash"))
    print(f"{len(common)} common trials ({len(set(a) ^ set(b))} in one report only), "
          f"{hashed} with output hashes; {len(status_diff)} status differences, "
          f"{len(hash_diff)} output differences")
    for t in (status_diff + hash_diff)[:20]:
        print("  differs:", t)
    return 0 if not status_diff and not hash_diff and hashed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
