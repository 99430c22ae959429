module rip18/porcupinecheck

go 1.19

require github.com/anishathalye/porcupine v1.3.1
