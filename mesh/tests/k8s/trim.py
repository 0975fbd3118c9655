# Trim kubernetes-validate's v1.35.0-local-strict definitions to the kinds halo renders.
import json, re, sys
src = sys.argv[1]
defs = json.load(open(f"{src}/_definitions.json"))["$defs"]
kinds = {
    ("v1", "Namespace"): "io.k8s.api.core.v1.Namespace",
    ("v1", "ServiceAccount"): "io.k8s.api.core.v1.ServiceAccount",
    ("v1", "ConfigMap"): "io.k8s.api.core.v1.ConfigMap",
    ("v1", "Service"): "io.k8s.api.core.v1.Service",
    ("v1", "PersistentVolumeClaim"): "io.k8s.api.core.v1.PersistentVolumeClaim",
    ("apps/v1", "Deployment"): "io.k8s.api.apps.v1.Deployment",
    ("networking.k8s.io/v1", "NetworkPolicy"): "io.k8s.api.networking.v1.NetworkPolicy",
    ("policy/v1", "PodDisruptionBudget"): "io.k8s.api.policy.v1.PodDisruptionBudget",
}
def fix(v):
    if isinstance(v, dict):
        return {k: (re.sub(r"^/api/_definitions\.json#", "#", x) if k == "$ref" else fix(x)) for k, x in v.items() for x in [x]}
    if isinstance(v, list):
        return [fix(x) for x in v]
    return v
need, todo = set(), list(kinds.values())
while todo:
    n = todo.pop()
    if n in need: continue
    need.add(n)
    todo += re.findall(r'#/\$defs/([^"]+)"', json.dumps(fix(defs[n])))
out = {
    "source": "kubernetes-validate 1.37.0 (PyPI), kubernetes-json-schema/v1.35.0-local-strict/_definitions.json, trimmed by mesh/tests/k8s/README.md's script",
    "kinds": {f"{a} {k}": d for (a, k), d in kinds.items()},
    "$defs": {n: fix(defs[n]) for n in sorted(need)},
}
json.dump(out, open(sys.argv[2], "w"), indent=None, sort_keys=True, separators=(",", ":"))
