# Runs the minimal example to produce a run directory, then checks the CLI's
# summary, its --json output, a torn/corrupt log, and a missing directory.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} -E env RANKSCOPE_DIR=${WORK}/run ${EXAMPLE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "example failed (${rc}): ${out} ${err}")
endif()

execute_process(COMMAND ${CLI} summary ${WORK}/run RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "0..4" OR NOT out MATCHES "world_size=1")
  message(FATAL_ERROR "summary: rc=${rc}\n${out}\n${err}")
endif()

execute_process(COMMAND ${CLI} summary --json ${WORK}/run RESULT_VARIABLE rc OUTPUT_VARIABLE out)
string(JSON steps GET "${out}" ranks 0 steps)
string(JSON dropped GET "${out}" ranks 0 events_dropped)
if(NOT steps EQUAL 5 OR NOT dropped EQUAL 0)
  message(FATAL_ERROR "summary --json: steps=${steps} dropped=${dropped}\n${out}")
endif()

# A rank killed mid-write: torn last line plus garbage; the summary still reads the rest.
file(READ ${WORK}/run/rank-0.jsonl log)
file(WRITE ${WORK}/run/rank-1.jsonl "${log}garbage line\n{\"kind\":\"phase\",\"t\":1")
execute_process(COMMAND ${CLI} summary ${WORK}/run RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "torn last line" OR NOT out MATCHES "1 corrupt lines skipped")
  message(FATAL_ERROR "summary of a torn log: rc=${rc}\n${out}")
endif()

execute_process(COMMAND ${CLI} summary ${WORK}/does-not-exist RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "not a run directory")
  message(FATAL_ERROR "missing dir: rc=${rc} ${err}")
endif()
