"""Writing the server's YAML configuration files from Python dicts, for the black-box test
fixtures (tests/server and tests/stress): a nested dict of scalars as block YAML, strings quoted.
"""


def _yaml_scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, list):  # flow style: [a, {k: v}]
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_yaml_scalar(x)}" for k, x in v.items()) + "}"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_yaml(d, indent=0):
    """A nested dict of scalars as block YAML (enough for the server's config files); lists (and
    dicts inside them) in flow style."""
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(" " * indent + f"{k}:")
            out.append(to_yaml(v, indent + 2))
        else:
            out.append(" " * indent + f"{k}: {_yaml_scalar(v)}")
    return "\n".join(x for x in out if x)
