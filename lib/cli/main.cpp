// `rankscope` — command-line tools over a run directory (cli.cpp).
#include "cli.hpp"

int main(int argc, char** argv) { return rankscope::cli::run(argc, argv); }
