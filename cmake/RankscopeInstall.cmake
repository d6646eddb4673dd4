# Relocatable install: find_package(rankscope CONFIG) from any prefix.
include(CMakePackageConfigHelpers)

install(TARGETS rankscope_core rankscope_cli EXPORT rankscopeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/rankscope DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# Optional parts: one export set each, loaded by COMPONENTS.
foreach(_part torch nccl prometheus otlp)
  if(TARGET rankscope_${_part})
    install(TARGETS rankscope_${_part} EXPORT rankscope_${_part}Targets
            LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
    install(EXPORT rankscope_${_part}Targets NAMESPACE rankscope:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/rankscope)
  endif()
endforeach()

set(RANKSCOPE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/rankscope)
install(EXPORT rankscopeTargets NAMESPACE rankscope:: DESTINATION ${RANKSCOPE_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/rankscopeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/rankscopeConfig.cmake
                              INSTALL_DESTINATION ${RANKSCOPE_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/rankscopeConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/rankscopeConfig.cmake ${PROJECT_BINARY_DIR}/rankscopeConfigVersion.cmake
        DESTINATION ${RANKSCOPE_CMAKE_DIR})
