from benchmarks.run import main

main()
