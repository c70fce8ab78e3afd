# What `cmake --install <build> --prefix P` puts under P (docs/install.md),
# by component (`--component NAME` installs one):
#
#   shoal_runtime      lib/libshoal.so; bin/shoalrun and share/shoalrun/ (tools/shoalrun)
#   shoal_development  include/shoal/*.h; lib/cmake/shoal/ (find_package(shoal))
#   shoal_tools        bin/shoal-perf, bin/shoal-trace
#   shoal_python       shoal._C and _build_info.py (python/shoal/csrc), only when
#                      asked for by name: the wheel (setup.py) installs it with
#                      shoal_runtime into its package folder, P = <wheel>/shoal
#
# Executables find libshoal through a relative RPATH ($ORIGIN/../lib), so a
# prefix can be moved. libshoal's own dependencies (OpenSSL's libcrypto,
# Highway) are private to the shared library: a program that links
# shoal::shoal needs only Threads, which shoalConfig.cmake finds.
include(CMakePackageConfigHelpers)

set(SHOAL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/shoal)

install(TARGETS shoal EXPORT shoalTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT shoal_runtime)
install(DIRECTORY include/shoal DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT shoal_development)
install(EXPORT shoalTargets NAMESPACE shoal:: DESTINATION ${SHOAL_CMAKE_DIR} COMPONENT shoal_development)

configure_package_config_file(cmake/shoalConfig.cmake.in ${CMAKE_BINARY_DIR}/cmake/shoalConfig.cmake
  INSTALL_DESTINATION ${SHOAL_CMAKE_DIR})
# 0.x: a minor version may change the API, so only the same minor version matches.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/shoalConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/shoalConfig.cmake ${CMAKE_BINARY_DIR}/cmake/shoalConfigVersion.cmake
  DESTINATION ${SHOAL_CMAKE_DIR} COMPONENT shoal_development)
