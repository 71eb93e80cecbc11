package cdc

// PostgresCPU is postgresCPU, for the benchmarks of package cdc_test.
var PostgresCPU = postgresCPU
