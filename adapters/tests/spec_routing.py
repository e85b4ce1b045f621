"""relattn's routing model (docs/operator.md section 3 and 4.1), written again in Python for the workers' tests, and
the 2,160 shapes of relattn's routing trials (harness/src/trial_list.rs)."""

import itertools

# docs/operator.md section 3: capability -> (path or None when rejected, split_kv)
ROUTES = {
    "8.0": ("fallback", False), "8.6": ("fallback", False), "8.7": ("fallback", False),
    "8.9": ("fallback", False), "9.0": ("score_mod", False),
    "10.0": ("sheared_bias", True), "10.3": ("sheared_bias", True), "11.0": ("sheared_bias", True),
    "12.0": (None, False), "12.1": (None, False),
}


def bucket_max_seqlen_q(n):
    return 1 << max(0, n - 1).bit_length()


def spec_num_splits(split_kv, is_local, batch, max_query_len, heads, kv_heads, max_kv_len):
    """docs/operator.md section 4.1, line by line."""
    if not split_kv:
        return 1
    if is_local:
        return 1
    q_rows = bucket_max_seqlen_q(max_query_len) * (heads // kv_heads)
    q_tiles = -(-q_rows // 256)
    base_ctas = batch * kv_heads * q_tiles
    target = 256 if (q_tiles == 1 and batch == 1) else (128 if q_tiles == 1 else 64)
    max_split = 128
    if q_tiles == 1 and batch == 1:
        if kv_heads == 8:
            max_split = 16
        elif kv_heads == 4 or max_kv_len <= 8192:
            max_split = 32
        elif max_kv_len <= 65536:
            max_split = 64
    return max(1, min(target // base_ctas, max_split, -(-max_kv_len // 128)))


def spec_decode_splits(shape):
    """docs/operator.md section 4.3 on the fallback path: the split-KV decode's split count, 1 when it does not run."""
    mql, mkv = bucket_max_seqlen_q(shape["max_query_len"]), shape["max_kv_len"]
    page, wl = shape.get("page_size", 16), shape.get("window_left", -1)
    if mql != 1:
        return 1
    if not (mkv >= 8192 or page >= 64 or (wl >= 0 and page >= 32)):
        return 1
    if wl >= 0:
        return min(4, max(1, -(-min(mkv, wl + 1) // 128)))
    return min(32, max(1, -(-max(1, mkv) // 2048)))


def spec_route(cc, shape):
    """The answer relattn's model gives, in the protocol's route-answer form."""
    path, split_kv = ROUTES.get(cc, (None, False))
    if path is None:
        return {"path": None, "rejected": True, "num_splits": None}
    n = spec_num_splits(split_kv, shape["is_local"], shape["batch"], shape["max_query_len"],
                        shape["heads"], shape["kv_heads"], shape["max_kv_len"])
    return {"path": path, "rejected": False, "num_splits": n}


def routing_shapes():
    """batch x max_query_len x (heads, kv_heads) x max_kv_len x (is_local, window_left) x page."""
    for batch, mql, (h, kv), mkv, (local, wl), page in itertools.product(
            [1, 8, 32], [1, 9, 128, 2048], [(64, 8), (32, 4), (16, 2), (8, 1), (64, 16), (8, 2)],
            [512, 8192, 65536, 131072, 1048576], [(False, -1), (True, 511)], [16, 64, 128]):
        yield {"is_local": local, "batch": batch, "max_query_len": mql, "heads": h,
               "kv_heads": kv, "max_kv_len": mkv, "page_size": page, "window_left": wl}


def compare(route, capabilities=tuple(ROUTES)):
    """{cc: (shapes, agree, disagree, {class: count}, first disagreement)} for route(cc, shape)."""
    table = {}
    for cc in capabilities:
        shapes = agree = 0
        classes, example = {}, None
        for shape in routing_shapes():
            shapes += 1
            want, got = spec_route(cc, shape), route(cc, shape)
            same = (want["rejected"] == bool(got.get("rejected"))
                    and want["path"] == got.get("path")
                    and (want["rejected"] or want["num_splits"] == got.get("num_splits")))
            if same:
                agree += 1
                continue
            if want["rejected"]:
                kind = "unsupported architecture not rejected"
            elif want["path"] != got.get("path"):
                kind = "family misclassified"
            else:
                kind = "split-KV handed to an architecture without it" if want["num_splits"] == 1 \
                    else "num_splits differs"
            classes[kind] = classes.get(kind, 0) + 1
            example = example or {"shape": shape, "model": want, "worker": got}
        table[cc] = (shapes, agree, shapes - agree, classes, example)
    return table
