from benchmarks.run import main

if __name__ == "__main__":  # not again in the processes benchmarks.isolated spawns
    main()
