// rankscope/rankscope.hpp — everything a trainer needs; includes only.
#pragma once

#include "rankscope/collective.hpp"
#include "rankscope/config.hpp"
#include "rankscope/context.hpp"
#include "rankscope/flight_recorder.hpp"
#include "rankscope/exchange.hpp"
#include "rankscope/heartbeat.hpp"
#include "rankscope/invariants.hpp"
#include "rankscope/log.hpp"
#include "rankscope/metrics.hpp"
#include "rankscope/runtime.hpp"
#include "rankscope/site.hpp"
#include "rankscope/step.hpp"
#include "rankscope/timer.hpp"
