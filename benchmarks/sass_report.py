"""Resource and instruction report of the compiled kernels (no GPU needed, nvcc required;
cuobjdump optional): registers, spills and shared memory from ptxas, and from the SASS the
count of 16-byte global loads (LDG.E.128) and other memory/warp instructions per kernel.

    python benchmarks/sass_report.py [--arch sm_90] [--out DIR]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from dask_compact.backends.cupy_source import NVRTC_OPTIONS, ModuleSpec, module_source
from dask_compact.backends.cupy_tuning import tuning_for
from dask_compact.codegen.cuda_functor import generate_functor
from dask_compact.predicate.core import Predicate
from dask_compact.predicate.expr import Call, Param, Var


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--dtypes", default="float32,int8,float64,complex128")
    args = ap.parse_args()
    pred = Predicate(Call("less", (Var(), Param(0, "float"))), (0.5,), None, "x < 0.5")
    tmp = Path(tempfile.mkdtemp())
    for dt in args.dtypes.split(","):
        f = generate_functor(pred.typed(dt))
        for alg in ("single-pass", "hybrid", "three-pass"):
            spec = ModuleSpec(np.dtype(dt), alg, f, tuning_for(alg, np.dtype(dt).itemsize))
            names = spec.all_names()
            src = (
                module_source(spec)
                + "\nvoid* dcx_force[] = {"
                + ", ".join(f"(void*)&{n}" for n in names)
                + "};\n"
            )
            cu = tmp / f"{dt}_{alg}.cu"
            cu.write_text(src)
            cubin = cu.with_suffix(".cubin")
            opts = ["-std=c++17", *NVRTC_OPTIONS]
            r = subprocess.run(
                [
                    "nvcc",
                    f"-arch={args.arch}",
                    *opts,
                    "-cubin",
                    "-Xptxas",
                    "-v",
                    "-o",
                    str(cubin),
                    str(cu),
                ],
                capture_output=True,
                text=True,
            )
            print(f"## {dt} {alg} (tuning {spec.tuning})")
            fn = None
            for line in r.stderr.splitlines():
                m = re.search(r"Compiling entry function '(\S+)'", line)
                if m:
                    fn = m.group(1)
                if "registers" in line or "spill" in line:
                    print(f"  {fn[:60] if fn else ''}: {line.strip()}")
            if r.returncode:
                print(r.stderr[-3000:])
                continue
            if shutil.which("cuobjdump"):
                sass = subprocess.run(
                    ["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True
                ).stdout
                for chunk in sass.split("Function : ")[1:]:
                    name = chunk.split("\n", 1)[0].strip()
                    c = Counter()
                    for line in chunk.splitlines():
                        m = re.search(
                            r"\b((?:LDG|STG|LDS|STS|ATOMG|RED|VOTE|POPC|SHFL|BAR|NANOSLEEP)[.\w]*)",
                            line,
                        )
                        if m:
                            c[m.group(1)] += 1
                    print(
                        f"  SASS {name[:70]}: "
                        + ", ".join(f"{k}={v}" for k, v in sorted(c.items()))
                    )


if __name__ == "__main__":
    main()
