"""The static SASS profile: loop finding on a disassembly, and the command line's bad input."""
import shutil
from pathlib import Path

import pytest
import triton

from policies.kernels import sass

SNIPPET = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   FFMA R2, R3, R4, R2 ;
        /*0020*/              @P0 BRA `(.L_x_1) ;
        /*0030*/                   SHFL.BFLY PT, R5, R2, 0x1, 0x1f ;
.L_x_1:
        /*0040*/                   FADD R2, R2, R5 ;
        /*0050*/              @P1 BRA `(.L_x_0) ;
        /*0060*/                   EXIT ;
"""


def test_loops_span_label_to_the_branch_back():
    (label, mix), = sass.loops(SNIPPET)
    assert label == ".L_x_0" and mix == {"FFMA": 1, "BRA": 2, "SHFL": 1, "FADD": 1}


def test_bad_shape_is_one_line_exit_2(capsys):
    assert sass.main(["--shape", "7x1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--shape" in err


@pytest.mark.slow
@pytest.mark.skipif(not (Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm").exists(),
                    reason="triton without its NVIDIA tools")
def test_chain_kernel_compiles_for_sm90(capsys):
    assert sass.main(["--shape", "8x1"]) == 0
    assert "per 32 state values" in capsys.readouterr().out
