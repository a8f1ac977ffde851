# CMake toolchain file: cross-compile flashlm for 64-bit Arm Linux (aarch64) on a Debian/Ubuntu x86-64 host with
# gcc-aarch64-linux-gnu and the arm64 multiarch -dev packages (`make cross-arm64` installs them). ctest runs the test
# programs through qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR); FLM_QEMU_CPU picks the emulated CPU ("max": every
# extension qemu has, dotprod and i8mm among them).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(FLM_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${FLM_CROSS_TRIPLE}-gcc)
set(CMAKE_LINKER ${FLM_CROSS_TRIPLE}-ld CACHE FILEPATH "")
set(CMAKE_OBJCOPY ${FLM_CROSS_TRIPLE}-objcopy CACHE FILEPATH "")
set(CMAKE_AR ${FLM_CROSS_TRIPLE}-ar CACHE FILEPATH "")
set(CMAKE_RANLIB ${FLM_CROSS_TRIPLE}-ranlib CACHE FILEPATH "")
# libraries and headers: the arm64 multiarch ones (/usr/lib/aarch64-linux-gnu, /usr/include), never the host's
set(CMAKE_FIND_ROOT_PATH /usr/${FLM_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_LIBRARY_ARCHITECTURE ${FLM_CROSS_TRIPLE})
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${FLM_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
# the emulator ctest and add_custom_command run the target's programs through
find_program(FLM_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(FLM_QEMU_AARCH64)
  if(NOT DEFINED FLM_QEMU_CPU)
    set(FLM_QEMU_CPU max)
  endif()
  # no -L /usr/aarch64-linux-gnu: the programs load the arm64 multiarch libraries (/lib/aarch64-linux-gnu, libc6:arm64
  # with its own ld.so); the cross toolchain's libc copy is a different glibc build, and its ld.so with the multiarch
  # libc.so.6 hangs in pthread_create
  set(CMAKE_CROSSCOMPILING_EMULATOR ${FLM_QEMU_AARCH64} -cpu ${FLM_QEMU_CPU})
endif()
