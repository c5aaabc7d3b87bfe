#!/usr/bin/env python3
"""A ValidatingAdmissionPolicy's CEL evaluated against one pod, as the API server does, with cel-python
(celpy): the match conditions (none true: not matched, admitted), the params (a ConfigMap or none: the
binding's parameterNotFoundAction Deny), the variables in order, then each validation (false: denied with its
message or messageExpression; an evaluation error: denied, failurePolicy Fail). Kubernetes' CEL adds
libraries to the standard ones celpy has; the one the policy uses, the regex library's `find` (the first
match, "" for none), is given here with its upstream semantics.

usage: vap-eval.py CHART.yaml POLICY-NAME POD.json PARAMS.json|none  -> one line: admitted | not matched |
denied: MESSAGE
"""
import json
import re
import sys

import celpy
import yaml
from celpy import celtypes


def find(s, pattern):
    m = re.search(str(pattern), str(s))
    return celtypes.StringType(m.group(0) if m else "")


def main():
    chart, name, pod_file, params_file = sys.argv[1:5]
    policy = next(d for d in yaml.safe_load_all(open(chart))
                  if d and d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name)
    spec = policy["spec"]
    env = celpy.Environment()
    act = {"object": celpy.json_to_cel(json.load(open(pod_file)))}

    def run(expr):
        return env.program(env.compile(expr), functions={"find": find}).evaluate(act)

    try:
        if not all(bool(run(c["expression"])) for c in spec.get("matchConditions", [])):
            print("not matched")
            return
        if params_file == "none":
            print("denied: no params (parameterNotFoundAction Deny)")
            return
        act["params"] = celpy.json_to_cel(json.load(open(params_file)))
        variables = {}
        for v in spec.get("variables", []):
            act["variables"] = celtypes.MapType(variables)
            variables[celtypes.StringType(v["name"])] = run(v["expression"])
        act["variables"] = celtypes.MapType(variables)
        for v in spec["validations"]:
            ok = run(v["expression"])
            if isinstance(ok, celpy.CELEvalError):
                raise RuntimeError(ok)
            if not bool(ok):
                msg = run(v["messageExpression"]) if "messageExpression" in v else v["message"]
                print(f"denied: {msg}")
                return
        print("admitted")
    except Exception as e:  # failurePolicy: Fail
        print(f"denied: evaluation error: {e}")


main()
