package dev.replaysafe.registry;

import java.util.ArrayList;

import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;

/** The list of dynamic configuration properties, empty: the build step that indexes them is not on Maven Central. */
@ApplicationScoped
public class ConfigIndex {
    @Produces
    @ApplicationScoped
    public DynamicConfigPropertyList dynamicConfigPropertyList() {
        return new DynamicConfigPropertyList(new ArrayList<>());
    }
}
