"""Writes a copy of custom_ops/gpu/prefill_mma.cuh with compile-time knock-out knobs into OUT/gpu/ for
tools/gpu_prefill_probe.cu (compile with -IOUT before -Icustom_ops): NOSCALE (Q.K's two scaling FFMAs per element and
block become one FADD), NOSOFT (no online softmax), NOPV (no P.V; the logits are summed into the accumulator so Q.K
stays live), NOQK (no Q.K; constant logits). Results are wrong by design: timing only.
    python3 tools/gpu_prefill_probe_knobs.py build/probe
"""
import os, re, sys

here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(here, "..", "custom_ops", "gpu", "prefill_mma.cuh")).read()
# NOSCALE: one FADD per element and block instead of two FFMAs
patched = []
for l in src.split("\n"):
    m = re.match(r"(\s*)(s[01])\[(\d)\] = fmaf\(fmaf\(__int_as_float\((c[01])\[(\d)\]\), q[01], m[01]\), k\.[xyzw], s[01]\[\d\]\);", l)
    if m:
        ind, s, i, c, j = m.groups()
        patched += ["#ifdef NOSCALE", f"{ind}{s}[{i}] += __int_as_float({c}[{j}]);", "#else", l, "#endif"]
    else:
        patched.append(l)
assert patched.count("#ifdef NOSCALE") == 8, "the Q.K scaling lines changed: update this script"
src = "\n".join(patched)
def wrap(src, start, end, macro, alt=""):  # start / end markers must exist (ValueError otherwise)
    i = src.index(start)
    j = src.index(end, i)
    return src[:i] + f"#ifndef {macro}\n" + src[i:j] + f"#else\n{alt}\n#endif\n" + src[j:]
src = wrap(src, "    // ---- online softmax", "    // ---- O += P.V ----", "NOSOFT")
src = wrap(src, "    // ---- O += P.V ----", "  };\n\n  if constexpr (!kPipe)", "NOPV",
           "for (int mt = 0; mt < MT; ++mt) for (int n = 0; n < 8; ++n) oacc[mt][n][0] += S[mt][n][0] + S[mt][n][1] + S[mt][n][2] + S[mt][n][3];")
src = wrap(src, "    // K fragments and scales are double-buffered", "    // ---- masking", "NOQK",
           "for (int mt = 0; mt < MT; ++mt) for (int n = 0; n < 8; ++n) for (int e = 0; e < 4; ++e) S[mt][n][e] = float(j0 + n + e) * 1e-3f;")
out = os.path.join(sys.argv[1] if len(sys.argv) > 1 else "build/probe", "gpu")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "prefill_mma.cuh"), "w") as f:
    f.write(src)
print("wrote", os.path.join(out, "prefill_mma.cuh"))
