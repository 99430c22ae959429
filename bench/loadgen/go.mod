module nameserver-bench/loadgen

go 1.19
