from goodput.agent.main import main

if __name__ == "__main__":  # a spawned check process re-imports this module: it must not start an agent
    main()
