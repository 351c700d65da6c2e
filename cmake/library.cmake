# library.cmake - libmlxcel: the shared library over the public API
# (include/mlxcel.h, src/api), and what `cmake --install` puts in a prefix:
#   bin/mlxcel, lib/libmlxcel.so.0.x.y (+ .so.0, .so), lib/libmlxcel.a,
#   include/mlxcel.h, lib/pkgconfig/mlxcel.pc,
#   lib/cmake/mlxcel/mlxcelConfig.cmake (+ Version, Targets): mlxcel::mlxcel
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The header's version macros must say what the project says.
file(STRINGS ${CMAKE_SOURCE_DIR}/include/mlxcel.h MLXCEL_H_VERSION
     REGEX "^#define MLXCEL_VERSION_(MAJOR|MINOR|PATCH) [0-9]+$")
string(REGEX REPLACE "[^\n;]*_(MAJOR|MINOR|PATCH) ([0-9]+)" "\\2" MLXCEL_H_VERSION "${MLXCEL_H_VERSION}")
string(REPLACE ";" "." MLXCEL_H_VERSION "${MLXCEL_H_VERSION}")
if(NOT MLXCEL_H_VERSION STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "include/mlxcel.h says version ${MLXCEL_H_VERSION}, project() says ${PROJECT_VERSION}")
endif()

# The API's few files are compiled again for the shared library; everything
# else comes from the core archive, whose members the linker pulls only when
# the API needs them (so no server, synth or eval code in the .so).  The
# version script exports mlxcel_* and nothing else, whatever the archive's
# objects or their dependencies declare.
file(GLOB MLXCEL_API_SRC CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/api/*.c)
add_library(mlxcel_shared SHARED ${MLXCEL_API_SRC})
target_link_libraries(mlxcel_shared PRIVATE mlxcel_core)
target_include_directories(mlxcel_shared PUBLIC
  $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set(MLXCEL_MAP ${CMAKE_SOURCE_DIR}/src/api/mlxcel.map)
set_target_properties(mlxcel_shared PROPERTIES
  OUTPUT_NAME mlxcel EXPORT_NAME mlxcel
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  C_VISIBILITY_PRESET hidden
  PUBLIC_HEADER ${CMAKE_SOURCE_DIR}/include/mlxcel.h
  LINK_DEPENDS ${MLXCEL_MAP})
target_link_options(mlxcel_shared PRIVATE -Wl,--version-script=${MLXCEL_MAP} -Wl,--as-needed)
# Every symbol resolved at link time; not under the sanitizers, whose
# runtime is linked into the executable, not into shared libraries.
if(NOT MLXCEL_SANITIZE AND NOT MLXCEL_FUZZ)
  target_link_options(mlxcel_shared PRIVATE -Wl,--no-undefined)
endif()

install(TARGETS mlxcel RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS mlxcel_shared EXPORT mlxcelTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS mlxcel_core ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

# pkg-config: paths relative to the .pc file itself, so the prefix given to
# `cmake --install --prefix` (or a moved tree) is right without reconfiguring.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(MLXCEL_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH MLXCEL_PC_UP "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
  string(REGEX REPLACE "/$" "" MLXCEL_PC_UP "${MLXCEL_PC_UP}")
  set(MLXCEL_PC_PREFIX "\${pcfiledir}/${MLXCEL_PC_UP}")
endif()
string(REPLACE ";" " " MLXCEL_PC_OPENMP "${OpenMP_C_FLAGS}")
# A CUDA build's archive holds the backend: static links need the CUDA
# runtime (static, as the executable links it) and the C++ runtime.
set(MLXCEL_PC_CUDA "")
if(MLXCEL_CUDA)
  set(MLXCEL_PC_CUDA "-L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt -lstdc++")
endif()
configure_file(${CMAKE_SOURCE_DIR}/cmake/mlxcel.pc.in ${CMAKE_BINARY_DIR}/mlxcel.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/mlxcel.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# CMake: find_package(mlxcel) gives the imported target mlxcel::mlxcel.
set(MLXCEL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mlxcel)
install(EXPORT mlxcelTargets NAMESPACE mlxcel:: DESTINATION ${MLXCEL_CMAKE_DIR})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/mlxcelConfig.cmake.in
  ${CMAKE_BINARY_DIR}/mlxcelConfig.cmake INSTALL_DESTINATION ${MLXCEL_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/mlxcelConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/mlxcelConfig.cmake ${CMAKE_BINARY_DIR}/mlxcelConfigVersion.cmake
  DESTINATION ${MLXCEL_CMAKE_DIR})
