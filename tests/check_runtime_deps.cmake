# check_runtime_deps.cmake — the runtime tier links no BLAS/LAPACK (issue 18, "Two library tiers"). Run by CTest
# (test_runtime_deps, tests/CMakeLists.txt) as: cmake -DNM=nm -DREADELF=readelf -DFILES="a|b|c" -DTOOLS=tools.a
# -DPROGRAM=prog -P check_runtime_deps.cmake
#   FILES    the runtime archives (libflashlm.a, libflashlm_internal.a) and a program linking only libflashlm.a:
#            `nm -u` of each must name no BLAS/LAPACK symbol (cblas_*, LAPACKE_*, openblas_*, Fortran BLAS/LAPACK
#            names such as sgemm_ or ssyevr_);
#   TOOLS    the tools archive: its `nm -u` must name cblas_ and LAPACKE_ symbols (the check can see them at all);
#   PROGRAM  that program: `readelf -d` lists no libopenblas, libblas, liblapack, liblapacke among its NEEDED.
set(BLAS_RE "(^|[ \t])(cblas_[a-z0-9_]+|LAPACKE_[a-z0-9_]+|LAPACK_[a-z0-9_]+|openblas_[a-z0-9_]+|[sdcz](gemm|gemv|syrk|syevr|syev|gesv|gesvd|gesdd|potrf|getrf|axpy|dot|scal|nrm2)_)$")
string(REPLACE "|" ";" FILES "${FILES}")
set(bad "")
foreach(f ${FILES})
  if(NOT EXISTS "${f}")
    message(FATAL_ERROR "${f}: not built")
  endif()
  execute_process(COMMAND ${NM} -u "${f}" OUTPUT_VARIABLE out RESULT_VARIABLE rc ERROR_VARIABLE errout)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} -u ${f} failed (${rc}): ${errout}")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  set(n 0)
  foreach(l ${lines})
    math(EXPR n "${n} + 1")
    string(STRIP "${l}" l)
    if(l MATCHES "${BLAS_RE}")
      list(APPEND bad "${f}: ${l}")
    endif()
  endforeach()
  message(STATUS "nm -u ${f}: ${n} undefined symbols, none from BLAS/LAPACK unless listed below")
endforeach()
if(bad)
  string(REPLACE ";" "\n  " bad "${bad}")
  message(FATAL_ERROR "the runtime tier needs BLAS/LAPACK symbols (they belong in the tools tier, src/calibrate/):\n  ${bad}")
endif()
# the positive control: the same nm sees the tools tier's BLAS/LAPACK calls
execute_process(COMMAND ${NM} -u "${TOOLS}" OUTPUT_VARIABLE tout RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT tout MATCHES "cblas_sgemm" OR NOT tout MATCHES "LAPACKE_ssyevr")
  message(FATAL_ERROR "nm -u ${TOOLS} shows no cblas_sgemm / LAPACKE_ssyevr: the check cannot see BLAS symbols")
endif()
execute_process(COMMAND ${READELF} -d "${PROGRAM}" OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${PROGRAM} failed")
endif()
if(dyn MATCHES "NEEDED[^\n]*(openblas|libblas|liblapack|libcblas)")
  message(FATAL_ERROR "${PROGRAM} links only libflashlm.a yet needs a BLAS/LAPACK library:\n${dyn}")
endif()
message(STATUS "ok: no BLAS/LAPACK symbol or library in the runtime tier")
