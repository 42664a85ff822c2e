# -*- Python -*-
import os
import lit.formats

config.name = "planc"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".mlir", ".plan", ".test"]
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py",
                   "runtime"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.planc_obj_root, "test")

bin_dir = os.path.join(config.planc_obj_root, "bin")
config.environment["PATH"] = os.pathsep.join(
    [bin_dir, config.llvm_tools_dir, config.environment.get("PATH", "")])
# OpenBLAS's kernel choice is the machine's (some CPUs need it set): passed
# through as it is.
for var in ["HOME", "TMPDIR", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"]:
    if var in os.environ:
        config.environment[var] = os.environ[var]
# OpenMPI refuses root without these; --oversubscribe lets 2 cores run 4 ranks.
config.environment["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
config.environment["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
config.environment["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
# Every generated program fills a buffer with NaN when the memory plan ends
# its life, so a read past a planned lifetime shows in the results.
config.environment["PLANRT_POISON"] = "1"
# A hung test (a rank waiting for a dead one, a wait loop) fails after 600 s
# instead of hanging CI; the slowest test takes about 100 s. lit needs psutil
# to kill a test's processes: without it, say so and run unbounded.
if lit_config.maxIndividualTestTime == 0:  # not given with --timeout
    supported, why = lit_config.maxIndividualTestTimeIsSupported
    if supported:
        lit_config.maxIndividualTestTime = 600
    else:
        lit_config.warning("no per-test timeout: " + why)

config.substitutions.append(("%planc_src", config.planc_src_root))
config.substitutions.append(("%planc_build", config.planc_obj_root))
config.substitutions.append(("%examples", os.path.join(config.planc_src_root, "examples")))
config.substitutions.append(("%mpirun", config.mpiexec + " --oversubscribe"))
config.substitutions.append(("%python", "/usr/bin/python3"))
config.substitutions.append(("%scripts", os.path.join(config.planc_src_root, "test", "e2e")))
if config.cuda_enabled:
    config.available_features.add("cuda")
    # A GPU this machine can run on (none on the development machines).
    import shutil, subprocess
    smi = shutil.which("nvidia-smi")
    if smi and subprocess.run([smi, "-L"], capture_output=True).returncode == 0:
        config.available_features.add("gpu")
    # A generated program's CUDA C++ compiled (not linked) with nvcc's and
    # the host compiler's warnings as errors, as planc compiles it.
    includes = [os.path.join(config.planc_src_root, "runtime", "include")]
    includes += [i for i in config.mpi_includes.split(";") if i]
    config.substitutions.append(("%nvcc_strict", " ".join(
        [config.nvcc, "-O2", "-std=c++17", "-gencode=arch=compute_80,code=sm_80"]
        + ["-I" + i for i in includes]
        + ["-Werror", "all-warnings", "-Xcompiler=-Wall,-Wextra,-Werror"])))
