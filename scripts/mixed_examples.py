"""Writes the mixed-reduction examples (small + full)."""
import json, sys
from pathlib import Path
out = Path(sys.argv[1])

def inp(shape, dt="float32"): return {"shape": shape, "dtype": dt}
def red(i, op, a, axes, keep=True): return {"id": i, "op": op, "args": [a], "axes": axes, "keepdims": keep}
def n(i, op, *args): return {"id": i, "op": op, "args": list(args)}

def layernorm_backward(name, M, N, dt="float32", desc=""):
    nodes = []
    x, dy, g = "x", "dy", "gamma"
    if dt != "float32":
        nodes += [{"id": "xf", "op": "cast", "args": ["x"], "to": "float32"},
                  {"id": "dyf", "op": "cast", "args": ["dy"], "to": "float32"}]
        x, dy = "xf", "dyf"
    nodes += [n("xc", "sub", x, "mean"), n("xhat", "mul", "xc", "rstd"),
              n("dxhat", "mul", dy, g),
              red("m1", "reduce_mean", "dxhat", [-1]),
              n("dxx", "mul", "dxhat", "xhat"),
              red("m2", "reduce_mean", "dxx", [-1]),
              n("t1", "sub", "dxhat", "m1"), n("t2", "mul", "xhat", "m2"), n("t3", "sub", "t1", "t2"),
              n("dx32" if dt != "float32" else "dx", "mul", "t3", "rstd"),
              n("dyx", "mul", dy, "xhat"),
              red("dgamma", "reduce_sum", "dyx", [0], False),
              red("dbeta", "reduce_sum", dy, [0], False)]
    dxo = "dx32" if dt != "float32" else "dx"
    if dt != "float32":
        nodes.append({"id": "dx", "op": "cast", "args": ["dx32"], "to": dt}); dxo = "dx"
    return {"name": name, "description": desc,
            "inputs": {"x": inp([M, N], dt), "dy": inp([M, N], dt), "gamma": inp([N], dt),
                       "mean": inp([M, 1]), "rstd": inp([M, 1])},
            "nodes": nodes, "outputs": [dxo, "dgamma", "dbeta"]}

def rmsnorm_backward(name, M, N, desc=""):
    nodes = [n("xhat", "mul", "x", "rstd"), n("dxhat", "mul", "dy", "w"), n("dxx", "mul", "dxhat", "xhat"),
             red("m", "reduce_mean", "dxx", [-1]), n("t2", "mul", "xhat", "m"), n("t3", "sub", "dxhat", "t2"),
             n("dx", "mul", "t3", "rstd"), n("dyx", "mul", "dy", "xhat"),
             red("dw", "reduce_sum", "dyx", [0], False)]
    return {"name": name, "description": desc,
            "inputs": {"x": inp([M, N]), "dy": inp([M, N]), "w": inp([N]), "rstd": inp([M, 1])},
            "nodes": nodes, "outputs": ["dx", "dw"]}

def cross_entropy(name, M, V, desc=""):
    nodes = [red("mx", "reduce_max", "logits", [-1]), n("sh", "sub", "logits", "mx"), n("e", "exp", "sh"),
             red("se", "reduce_sum", "e", [-1]), n("ls", "log", "se"), n("lse", "add", "ls", "mx"),
             n("l", "sub", "lse", "target_logit"),
             red("loss", "reduce_mean", "l", [0, 1])]
    return {"name": name, "description": desc,
            "inputs": {"logits": inp([M, V]), "target_logit": inp([M, 1])},
            "nodes": nodes, "outputs": ["loss"]}

def softmax_colsum(name, M, N, desc=""):
    nodes = [red("mx", "reduce_max", "x", [-1]), n("sh", "sub", "x", "mx"), n("e", "exp", "sh"),
             red("se", "reduce_sum", "e", [-1]), n("y", "div", "e", "se"),
             red("colsum", "reduce_sum", "y", [0], False)]
    return {"name": name, "description": desc, "inputs": {"x": inp([M, N])}, "nodes": nodes,
            "outputs": ["y", "colsum"]}

def mse_loss(name, M, N, desc=""):
    nodes = [n("d", "sub", "pred", "target"), n("sq", "mul", "d", "d"),
             red("loss", "reduce_mean", "sq", [0, 1])]
    return {"name": name, "description": desc, "inputs": {"pred": inp([M, N]), "target": inp([M, N])},
            "nodes": nodes, "outputs": ["loss"]}

D = {
 "layernorm_backward": (lambda nm, M, N, desc: layernorm_backward(nm, M, N, desc=desc), (16384, 1024), (64, 256), "LayerNorm backward from the saved mean and rstd: dx (two row reductions), dgamma and dbeta (column sums over all rows, cross reductions)"),
 "layernorm_backward_bf16": (lambda nm, M, N, desc: layernorm_backward(nm, M, N, "bfloat16", desc), (16384, 1024), (64, 256), "LayerNorm backward, bfloat16 x / dy / gamma / dx, float32 mean / rstd, accumulation and dgamma / dbeta"),
 "rmsnorm_backward": (rmsnorm_backward, (16384, 4096), (64, 512), "RMSNorm backward from the saved rstd: dx (a row reduction) and dw (a column sum over all rows)"),
 "cross_entropy": (cross_entropy, (8192, 32000), (32, 1000), "Cross entropy: row log-sum-exp minus the target logit (a per-row float input: graph.json has no integer inputs or gather yet), then the mean over rows (a scalar)"),
 "softmax_colsum": (softmax_colsum, (16384, 1024), (64, 256), "Softmax over the rows and the column sums of the probabilities"),
 "mse_loss": (mse_loss, (16384, 4096), (64, 512), "Mean squared error to a scalar"),
}
for name, (fn, full, small, desc) in D.items():
    for suffix, shape in (("", full), ("_small", small)):
        g = fn(name + suffix, *shape, desc)
        (out / f"{name}{suffix}.json").write_text(json.dumps(g, indent=1) + "\n")
