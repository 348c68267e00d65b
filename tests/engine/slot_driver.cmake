# What the slot kinds' driver projects share (qwen35_bridge/, ming_image/: each its own project
# and build folder beside the tier's ../CMakeLists.txt, which is not touched): the settings, the
# gk CPU backend, and slot_driver(), the engine objects each probe is built over. slot_engine.py
# copies this file beside each project's CMakeLists.txt, which includes it after project().
set(CMAKE_C_STANDARD 11)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(BUILD_SHARED_LIBS OFF)
if (NOT CMAKE_BUILD_TYPE)
    set(CMAKE_BUILD_TYPE Release)
endif()
set(GK_BUILD_TESTS OFF CACHE BOOL "" FORCE)
add_compile_definitions(GGML_MAX_NAME=128 GK_MAX_NAME=128)

set(E ${ENGINE_DIR})
set(D ${E}/diffusion/src)
add_subdirectory(${E}/gk/compat gk_compat)

# slot_driver(TARGET SOURCES...): TARGET from SOURCES (the probe and the engine sources only it
# needs) and the tokenizer and graph objects every slot probe runs, on the gk backend;
# SNIPPET_DIR (engine lines the test cut, when the project is configured with it) is included.
function(slot_driver target)
    add_executable(${target} ${ARGN}
        ${D}/core/util.cpp
        ${D}/tokenizers/tokenizer.cpp
        ${D}/tokenizers/bpe_tokenizer.cpp
        ${D}/tokenizers/tokenize_util.cpp
        ${D}/tokenizers/vocab_provider.cpp
        ${D}/tokenizers/hf_tokenizer_json.cpp
        ${D}/core/ggml_extend_backend.cpp
        ${D}/core/ggml_graph_cut.cpp
        ${D}/core/layer_split_partition.cpp)
    target_include_directories(${target} PRIVATE ${D} ${D}/core ${D}/tokenizers
        ${E}/diffusion/include ${E}/diffusion/thirdparty ${E}/diffusion ${E}/gk/compat/src
        ${SNIPPET_DIR})
    target_link_libraries(${target} PRIVATE ggml)
endfunction()
