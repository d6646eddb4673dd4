# Warning and sanitizer flags, applied to our own targets only.
function(rankscope_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                                           -Wno-missing-field-initializers)
  if(RANKSCOPE_SANITIZE STREQUAL "address")
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                             -fno-sanitize-recover=undefined)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  elseif(RANKSCOPE_SANITIZE STREQUAL "thread")
    target_compile_options(${target} PRIVATE -fsanitize=thread -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  elseif(RANKSCOPE_SANITIZE STREQUAL "fuzzer")
    # libFuzzer coverage for our code (clang only); fuzz targets add -fsanitize=fuzzer.
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                                             -fno-sanitize-recover=undefined)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  elseif(NOT RANKSCOPE_SANITIZE STREQUAL "")
    message(FATAL_ERROR "RANKSCOPE_SANITIZE must be '', 'address', 'thread' or 'fuzzer' (clang)")
  endif()
endfunction()
