#pragma once
#include <cstdint>
#include <cstddef>
#include <cstdlib>
#include <cstring>
