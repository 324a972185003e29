// Mean and principal basis of a set of vectors: the recon router's topologies (dory
// calibrate) and a CMF skill's router (dory skill add).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace dory::cli {

// Orthonormalizes the r rows of Q (each n long) in place (modified Gram-Schmidt).
void orthonormalize(std::vector<double>& Q, int64_t n, int r);

// Mean and top-r principal basis (rows, orthonormal) of the rows of X [n x d]
// selected by `take`, by orthogonal iteration on their covariance.
void topology(const std::vector<float>& X, int64_t d, const std::vector<bool>& take, int r,
              Backend& be, std::vector<float>* mean, std::vector<float>* basis);

}  // namespace dory::cli
